# expect: assignment SlotFutureMapFactory
from specstrat import SlotFutureMapFactory, TargetVerifyPolicy

POLICY: TargetVerifyPolicy = SlotFutureMapFactory()
