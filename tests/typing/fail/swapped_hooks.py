# expect: assignment SlotFutureMapFactory
from specstrat import TargetVerifyPolicy
from specstrat.strategies import SlotFutureMapFactory

POLICY: TargetVerifyPolicy = SlotFutureMapFactory()
