"""Public path of the bridges: enqueue and resolve callbacks on your own connection.

The code lives in `awa.enqueue.bridge`; this module keeps ``awa.bridge.insert_job``
and the other documented names where users import them.
"""

from awa.enqueue.bridge import *  # noqa: F403
from awa.enqueue.bridge import __all__  # noqa: F401
