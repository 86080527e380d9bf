"""diagnosis: from "the answer changed" to the culprit op in one call (``docs/diagnose.md``)."""
