"""A fake plugin that fails at import, like one built against another API."""

raise ImportError("cannot import name 'Gone' from 'diffract' (simulated)")
