"""Integrations with inference engines: ``capture_vllm`` (docs/vllm.md)."""
