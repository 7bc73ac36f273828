"""gitresearch: a git-native harness for autonomous, perpetual ML research."""

__version__ = "0.1.0"
