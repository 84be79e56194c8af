"""Reliability checks that drive a real server from the outside and hold it to pass/fail targets."""
