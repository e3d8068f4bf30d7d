"""Old home of :mod:`kvstore.tiers.disk.recover`, kept because the torture tool imports
``live_records`` and ``recover_root`` from here; remove once it imports the new path."""

from kvstore.tiers.disk.recover import live_records, recover_root

__all__ = ["live_records", "recover_root"]
