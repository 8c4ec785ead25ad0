# expect: call-arg is_eagle
from specstrat import Capabilities

CAPS = Capabilities(is_eagle=True)
