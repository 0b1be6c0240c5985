"""The environment kinds of the tool-use domain, by name."""

from .bank import BANK
from .calendar import CALENDAR
from .inventory import INVENTORY
from .library import LIBRARY

KINDS = {k.name: k for k in (BANK, INVENTORY, CALENDAR, LIBRARY)}

__all__ = ["KINDS"]
