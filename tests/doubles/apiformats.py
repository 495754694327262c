"""Value formats kube-apiserver checks (names, label keys and values, env var names, keys, ports,
IPs, quantities, base64), with the messages it answers in.

Ported from Kubernetes' apimachinery (``util/validation``, ``api/validate/content``,
``api/resource``): each ``is_*`` returns the apiserver's error strings, empty when the value is
valid. Pure functions: the API double (``apivalidation``) and tests share them.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from fractions import Fraction

DNS1123_LABEL_MAX = 63
DNS1123_SUBDOMAIN_MAX = 253
DNS1035_LABEL_MAX = 63
LABEL_VALUE_MAX = 63
LABEL_KEY_NAME_MAX = 63

_DNS1123_LABEL_FMT = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN_FMT = _DNS1123_LABEL_FMT + "(\\." + _DNS1123_LABEL_FMT + ")*"
_DNS1035_LABEL_FMT = "[a-z]([-a-z0-9]*[a-z0-9])?"
_LABEL_KEY_FMT = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
_LABEL_VALUE_FMT = "(" + _LABEL_KEY_FMT + ")?"
_ENV_VAR_NAME_FMT = "[-._a-zA-Z][-._a-zA-Z0-9]*"
_CONFIG_MAP_KEY_FMT = "[-._a-zA-Z0-9]+"
_QUANTITY_FMT = "^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$"

# \Z, not $: Go's $ matches only at the very end, Python's also before a final newline.
_DNS1123_LABEL = re.compile(f"^{_DNS1123_LABEL_FMT}\\Z")
_DNS1123_SUBDOMAIN = re.compile(f"^{_DNS1123_SUBDOMAIN_FMT}\\Z")
_DNS1035_LABEL = re.compile(f"^{_DNS1035_LABEL_FMT}\\Z")
_LABEL_KEY = re.compile(f"^{_LABEL_KEY_FMT}\\Z")
_LABEL_VALUE = re.compile(f"^{_LABEL_VALUE_FMT}\\Z")
_ENV_VAR_NAME = re.compile(f"^{_ENV_VAR_NAME_FMT}\\Z")
_CONFIG_MAP_KEY = re.compile(f"^{_CONFIG_MAP_KEY_FMT}\\Z")
_PORT_NAME_CHARS = re.compile("^[-a-z0-9]+\\Z")


def regex_error(message: str, fmt: str, *examples: str) -> str:
    """apimachinery's RegexError: the rule, examples, and the regex itself."""
    if not examples:
        return f"{message} (regex used for validation is '{fmt}')"
    shown = " or ".join(f"'{example}', " for example in examples)
    return f"{message} (e.g. {shown}regex used for validation is '{fmt}')"


def max_len_error(length: int, unit: str = "characters") -> str:
    # The names' checks say "characters"; the label checks (api/validate/content) say "bytes".
    return f"must be no more than {length} {unit}"


def inclusive_range_error(low: int, high: int) -> str:
    return f"must be between {low} and {high}, inclusive"


def is_dns1123_label(value: str) -> list[str]:
    errors = []
    if len(value) > DNS1123_LABEL_MAX:
        errors.append(max_len_error(DNS1123_LABEL_MAX))
    if not _DNS1123_LABEL.match(value):
        if _DNS1123_SUBDOMAIN.match(value):
            errors.append("must not contain dots")  # a valid subdomain of right length: only dots are wrong
        else:
            errors.append(
                regex_error(
                    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and "
                    "must start and end with an alphanumeric character",
                    _DNS1123_LABEL_FMT,
                    "my-name",
                    "123-abc",
                )
            )
    return errors


def is_dns1123_subdomain(value: str, unit: str = "characters") -> list[str]:
    errors = []
    if len(value) > DNS1123_SUBDOMAIN_MAX:
        errors.append(max_len_error(DNS1123_SUBDOMAIN_MAX, unit))
    if not _DNS1123_SUBDOMAIN.match(value):
        errors.append(
            regex_error(
                "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', "
                "and must start and end with an alphanumeric character",
                _DNS1123_SUBDOMAIN_FMT,
                "example.com",
            )
        )
    return errors


def is_dns1035_label(value: str) -> list[str]:
    errors = []
    if len(value) > DNS1035_LABEL_MAX:
        errors.append(max_len_error(DNS1035_LABEL_MAX))
    if not _DNS1035_LABEL.match(value):
        errors.append(
            regex_error(
                "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an "
                "alphabetic character, and end with an alphanumeric character",
                _DNS1035_LABEL_FMT,
                "my-name",
                "abc-123",
            )
        )
    return errors


def mask_trailing_dash(name: str) -> str:
    """A ``generateName`` prefix may end with '-': random characters follow it."""
    if len(name) > 1 and name.endswith("-"):
        return name[:-2] + "a"
    return name


_LABEL_KEY_RULE = (
    "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character"
)


def is_qualified_name(value: str) -> list[str]:
    """A label key (also annotation keys, resource names, taint keys): ``[prefix/]name``, the prefix a
    DNS-1123 subdomain, the name at most 63 characters."""
    errors = []
    parts = value.split("/")
    if len(parts) == 1:
        name = parts[0]
    elif len(parts) == 2:
        prefix, name = parts
        if not prefix:
            errors.append("prefix part must be non-empty")
        else:
            errors += [f"prefix part {message}" for message in is_dns1123_subdomain(prefix, unit="bytes")]
    else:
        return [
            "a valid label key "
            + regex_error(_LABEL_KEY_RULE, _LABEL_KEY_FMT, "MyName", "my.name", "123-abc")
            + " with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"
        ]
    if not name:
        errors.append("name part must be non-empty")
    elif len(name) > LABEL_KEY_NAME_MAX:
        errors.append("name part " + max_len_error(LABEL_KEY_NAME_MAX, "bytes"))
    if not _LABEL_KEY.match(name):
        errors.append("name part " + regex_error(_LABEL_KEY_RULE, _LABEL_KEY_FMT, "MyName", "my.name", "123-abc"))
    return errors


def is_label_value(value: str) -> list[str]:
    errors = []
    if len(value) > LABEL_VALUE_MAX:
        errors.append(max_len_error(LABEL_VALUE_MAX, "bytes"))
    if not _LABEL_VALUE.match(value):
        errors.append(
            regex_error(
                "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', "
                "and must start and end with an alphanumeric character",
                _LABEL_VALUE_FMT,
                "MyValue",
                "my_value",
                "12345",
            )
        )
    return errors


def _chdir_prefix(value: str) -> list[str]:
    if value == ".":
        return ["must not be '.'"]
    if value == "..":
        return ["must not be '..'"]
    if value.startswith(".."):
        return ["must not start with '..'"]
    return []


def is_env_var_name(value: str) -> list[str]:
    """The env var name rule of clusters up to 1.33 without RelaxedEnvironmentVariableValidation (on by
    default from 1.32): the stricter of the two, so a job runs on every supported cluster."""
    errors = []
    if not _ENV_VAR_NAME.match(value):
        errors.append(
            regex_error(
                "a valid environment variable name must consist of alphabetic characters, digits, '_', '-', or "
                "'.', and must not start with a digit",
                _ENV_VAR_NAME_FMT,
                "my.env-name",
                "MY_ENV.NAME",
                "MyEnvName1",
            )
        )
    return errors + _chdir_prefix(value)


def is_config_map_key(value: str) -> list[str]:
    """A key of a ConfigMap or Secret (it becomes a file name in a volume)."""
    errors = []
    if len(value) > DNS1123_SUBDOMAIN_MAX:
        errors.append(max_len_error(DNS1123_SUBDOMAIN_MAX))
    if not _CONFIG_MAP_KEY.match(value):
        errors.append(
            regex_error(
                "a valid config key must consist of alphanumeric characters, '-', '_' or '.'",
                _CONFIG_MAP_KEY_FMT,
                "key.name",
                "KEY_NAME",
                "key-name",
            )
        )
    return errors + _chdir_prefix(value)


def is_valid_port_num(port: int) -> list[str]:
    return [] if 1 <= port <= 65535 else [inclusive_range_error(1, 65535)]


def is_valid_port_name(port: str) -> list[str]:
    """IANA service names as Kubernetes restricts them: at most 15 of [-a-z0-9], a letter, no '--'."""
    errors = []
    if len(port) > 15:
        errors.append(max_len_error(15))
    if not _PORT_NAME_CHARS.match(port):
        errors.append("must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)")
    if not re.search("[a-z]", port):
        errors.append("must contain at least one letter (a-z)")
    if "--" in port:
        errors.append("must not contain consecutive hyphens")
    if port and (port[0] == "-" or port[-1] == "-"):
        errors.append("must not begin or end with a hyphen")
    return errors


def is_valid_ip(value: str) -> list[str]:
    """An IP in a legacy field (Service clusterIP): IPv4 or IPv6; IPv4 parts with leading zeros are
    refused by current apiservers."""
    try:
        ipaddress.ip_address(value)
    except ValueError:
        parts = value.split(".")
        if len(parts) == 4 and all(re.fullmatch("[0-9]{1,3}", p) and int(p) < 256 for p in parts):
            return ["must not have leading 0s"]
        return ["must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)"]
    return []


# --- resource quantities ------------------------------------------------------------------------

QUANTITY_FORMAT_ERROR = f"quantities must match the regular expression '{_QUANTITY_FMT}'"
QUANTITY_SUFFIX_ERROR = "unable to parse quantity's suffix"

_DECIMAL_SUFFIXES = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_BINARY_SUFFIXES = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DECIMAL_NAMES = {exponent: suffix for suffix, exponent in _DECIMAL_SUFFIXES.items()}
_BINARY_NAMES = {exponent: suffix for suffix, exponent in _BINARY_SUFFIXES.items()}


class QuantityError(ValueError):
    """The text is not a quantity: the apiserver cannot even decode the object (400)."""


@dataclass(frozen=True)
class Quantity:
    """A parsed quantity: its exact value and the format it was written in."""

    value: Fraction
    format: str  # "DecimalSI", "BinarySI" or "DecimalExponent"

    def __str__(self) -> str:
        return canonical_quantity(self)


def parse_quantity(text: object) -> Quantity:
    """Kubernetes' ParseQuantity (a JSON number is read from its text, as the apiserver does)."""
    if isinstance(text, bool) or not isinstance(text, str | int | float):
        raise QuantityError(QUANTITY_FORMAT_ERROR)
    raw = str(text).strip() if not isinstance(text, str) else text
    if not raw:
        raise QuantityError(QUANTITY_FORMAT_ERROR)
    if raw == "0":
        return Quantity(Fraction(0), "DecimalSI")
    positive, number, suffix = _scan_quantity(raw)
    base, exponent, fmt = _interpret_suffix(suffix)
    value = Fraction(number) * (Fraction(base) ** exponent)
    return Quantity(value if positive else -value, fmt)


def _scan_quantity(text: str) -> tuple[bool, str, str]:
    """The apiserver's fast scanner: sign, digits, optional fraction, then the suffix."""
    match = re.match(r"^([+-]?)([0-9]*)(?:\.([0-9]*))?(.*)$", text, re.DOTALL)
    assert match is not None  # every string matches
    sign, whole, fraction, rest = match.groups()
    suffix_match = re.match(r"^([eEinumkKMGTP]*)([-+]?)([0-9]*)\Z", rest)
    if suffix_match is None:
        raise QuantityError(QUANTITY_FORMAT_ERROR)
    number = f"{whole or '0'}.{fraction or '0'}"
    return sign != "-", number, rest


def _interpret_suffix(suffix: str) -> tuple[int, int, str]:
    if suffix in _DECIMAL_SUFFIXES:
        return 10, _DECIMAL_SUFFIXES[suffix], "DecimalSI"
    if suffix in _BINARY_SUFFIXES:
        return 2, _BINARY_SUFFIXES[suffix], "BinarySI"
    if len(suffix) > 1 and suffix[0] in "eE" and re.fullmatch(r"[-+]?[0-9]+", suffix[1:]):
        return 10, int(suffix[1:]), "DecimalExponent"
    raise QuantityError(QUANTITY_SUFFIX_ERROR)


def canonical_quantity(quantity: Quantity) -> str:
    """How the apiserver prints a quantity: the largest suffix that keeps an integer mantissa
    (decimal exponents in steps of 3, binary ones in powers of 1024), at most nano precision."""
    value = quantity.value
    fmt = quantity.format
    if fmt == "BinarySI" and (-1024 < value < 1024 or value.denominator != 1):
        fmt = "DecimalSI"  # small or fractional values print in decimal, without rounding
    if fmt == "BinarySI":
        mantissa, exponent = int(value), 0
        while mantissa and mantissa % 1024 == 0 and exponent < 60:
            mantissa //= 1024
            exponent += 10
        return f"{mantissa}{_BINARY_NAMES[exponent]}"
    nanos = -((-value * 10**9) // 1)  # rounded up to whole nano units
    if nanos == 0:
        return "0"
    mantissa, exponent = int(nanos), -9
    while mantissa % 10 == 0:
        mantissa //= 10
        exponent += 1
    extra = exponent % 3
    mantissa, exponent = mantissa * 10**extra, exponent - extra
    if fmt == "DecimalExponent":
        return f"{mantissa}e{exponent}" if exponent else str(mantissa)
    while exponent > 18:
        mantissa, exponent = mantissa * 1000, exponent - 3
    return f"{mantissa}{_DECIMAL_NAMES[exponent]}"


# --- base64 as Go's encoding/json decodes []byte -------------------------------------------------

_BASE64_ALPHABET = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/")


def base64_error(text: str) -> str | None:
    """Go's StdEncoding error for ``text`` ("illegal base64 data at input byte N"), None if valid.
    Line breaks are skipped, padding is required, as in Go."""
    data = text.encode()
    position, length = 0, len(data)
    while position < length:
        quantum = 0
        while quantum < 4:
            if position == length:
                if quantum == 0:
                    return None
                return _illegal_base64(position - quantum)
            char = chr(data[position])
            position += 1
            if char in "\r\n":
                continue
            if char in _BASE64_ALPHABET:
                quantum += 1
                continue
            if char != "=":
                return _illegal_base64(position - 1)
            # padding: '=' may only stand at the 3rd or 4th place of a quantum
            if quantum < 2:
                return _illegal_base64(position - 1)
            if quantum == 2:
                while position < length and chr(data[position]) in "\r\n":
                    position += 1
                if position == length:
                    return _illegal_base64(length)
                if chr(data[position]) != "=":
                    return _illegal_base64(position - 1)
                position += 1
            while position < length and chr(data[position]) in "\r\n":
                position += 1
            if position < length:
                return _illegal_base64(position)
            return None
    return None


def _illegal_base64(offset: int) -> str:
    return f"illegal base64 data at input byte {offset}"


def base64_decoded_size(text: str) -> int:
    """Bytes ``text`` decodes to (for the 1 MiB limit of Secrets and ConfigMaps)."""
    clean = text.replace("\r", "").replace("\n", "")
    return len(clean) * 3 // 4 - clean[-2:].count("=")
