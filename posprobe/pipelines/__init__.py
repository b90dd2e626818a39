"""Pipelines: join model access, pure analysis and output. One function per CLI command."""
