"""Public path of the callback signing contract (`sign_request`, `verify_request`, ...).

The code lives in `awa.core.callback_contract` (pure functions, no I/O); this
module keeps the documented ``awa.callback_contract`` names where users import them.
"""

from awa.core.callback_contract import *  # noqa: F403
from awa.core.callback_contract import __all__  # noqa: F401
