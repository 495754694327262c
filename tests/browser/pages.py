"""What a user does on Airflow's pages, through Selenium: read the page, find and press a
button, open a tab, sign in with the simple auth manager's form. Shared by the browser tier
(Airflow on this machine) and the in-cluster tier (Airflow deployed in the real cluster)."""

from __future__ import annotations

import time
from typing import Any


def page_text(browser: Any) -> str:
    from selenium.webdriver.common.by import By

    return str(browser.find_element(By.TAG_NAME, "body").text)


def button(browser: Any, text: str = "", *, dialog: bool = False, label: str | None = None) -> Any:
    """The visible, enabled button with this text (or, given ``label``, this aria-label), in the
    open dialog if ``dialog``."""
    from selenium.webdriver.common.by import By

    scope = "//*[@role='dialog']" if dialog else ""
    for element in browser.find_elements(By.XPATH, f"{scope}//button"):
        named = element.get_attribute("aria-label") == label if label is not None else element.text.strip() == text
        if named and element.is_displayed() and element.is_enabled():
            return element
    return None


def press(browser: Any, element: Any) -> None:
    """Click as a user does, once the element is in view (a dialog may still be sliding in)."""
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'});", element)
    time.sleep(0.3)
    element.click()


def tab(browser: Any, name: str) -> Any:
    """The visible element whose own text is ``name`` (a tab of the task's page)."""
    from selenium.webdriver.common.by import By

    found = [e for e in browser.find_elements(By.XPATH, f"//*[normalize-space(text())='{name}']") if e.is_displayed()]
    return found[0] if found else None


def links_named(browser: Any, text: str) -> list[Any]:
    from selenium.webdriver.common.by import By

    return [a for a in browser.find_elements(By.TAG_NAME, "a") if a.text.strip() == text]


def sign_in_form(browser: Any) -> tuple[Any, Any] | None:
    """The simple auth manager's sign-in form, once shown: (username, password) inputs."""
    from selenium.webdriver.common.by import By

    inputs = [e for e in browser.find_elements(By.TAG_NAME, "input") if e.is_displayed()]
    secret = [e for e in inputs if e.get_attribute("type") == "password"]
    plain = [e for e in inputs if e.get_attribute("type") in ("text", None, "")]
    return (plain[0], secret[0]) if secret and plain else None


def sign_in(browser: Any, url: str, user: str, password: str, wait: Any) -> None:
    """Open Airflow at ``url`` and sign in as a user does (Airflow sends a browser without its
    token to the sign-in page); ``wait(what, check, timeout)`` waits."""
    browser.get(url + "/")
    username, secret = wait("the sign-in form", lambda: sign_in_form(browser), 60)
    username.send_keys(user)
    secret.send_keys(password)
    press(browser, wait("Sign in", lambda: button(browser, "Sign in"), 30))
    wait("signed in", lambda: browser.get_cookie("_token") and "/auth/login" not in browser.current_url, 60)
