# expect: misc read-only
from specstrat import EAGLE

EAGLE.name = "NOT_EAGLE"
