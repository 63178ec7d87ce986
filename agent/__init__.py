"""Lockstep node agent: a small daemon that runs what the console asks.

Runtime dependencies are deliberately short: ``requests``, and ``pynvml``
(nvidia-ml-py) imported only when present. No Django, no torch.
"""

__version__ = "0.1.0"
