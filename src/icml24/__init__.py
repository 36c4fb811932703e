"""icml24: ICML 2024 papers as importable methods with CPU reproductions of their claims.

Each paper lives in its own subpackage (``icml24.<slug>``); ``icml24.registry`` lists them all.
"""

__version__ = "0.1.0"
