"""Shared by every layer: one UserError, CLI-from-dataclass, logging, files, fault injection."""
