"""The local stack supervisor (`stack`), on its way to `tools.stack`."""
