# expect: attr-defined is_eagle
from specstrat import EAGLE

if EAGLE.is_eagle():
    pass
