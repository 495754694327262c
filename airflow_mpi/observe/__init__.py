"""Reading a running job: pod states, readiness, admission waits, log lines, what the master
printed, world size, failure diagnosis."""
