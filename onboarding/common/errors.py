"""One exception type whose message always carries the cause and the fix.

Users read these in the Dagster UI without opening logs, so every raise site says what failed,
on which object, why, and what to do next.
"""

from __future__ import annotations

from onboarding.common.redact import redact_urls


class OnboardingError(RuntimeError):
    """An error a user can act on: `what` failed because `cause`; `fix` says what to do.

    Any URL quoted in it is redacted (`onboarding.common.redact`): these messages reach the
    run's logs and the event store, where a pasted credential must never land."""

    def __init__(self, what: str, cause: str, fix: str):
        what, cause, fix = redact_urls(what), redact_urls(cause), redact_urls(fix)
        self.what, self.cause, self.fix = what, cause, fix
        super().__init__(f"{what}: {cause}. {fix}")


class ConfigError(OnboardingError):
    """A configuration file or value is malformed; names the file and field."""


class FetchError(OnboardingError):
    """Fetching a checkpoint failed; nothing in the cache was overwritten."""


class IntegrityError(FetchError):
    """Bytes received do not match what the source recorded."""


class IncompleteCheckpointError(FetchError):
    """The source lacks files the checkpoint names (a shard of the index): nothing fetched."""


class OutputError(OnboardingError):
    """A rendered file (manifest, report) could not be written; the previous one is intact."""
