"""Typed errors of the KV block pool; the scheduler catches these, never bare exceptions."""


class KVPoolError(Exception):
    """Base class of every error raised by kvpool."""


class NoFreeBlocksError(KVPoolError):
    """Not enough free blocks for the request; the pool's state is unchanged."""


class UnknownSequenceError(KVPoolError, KeyError):
    """The sequence id has no block table (never allocated, or already freed)."""


class DuplicateSequenceError(KVPoolError):
    """The sequence id already has a block table."""


class KVInvariantError(KVPoolError, AssertionError):
    """check_invariants() found the pool's bookkeeping inconsistent (a bug, never a user error)."""
