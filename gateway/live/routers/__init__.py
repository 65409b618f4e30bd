"""The gateway's HTTP routes, one router per surface: ``workflows``, ``chat`` (OpenAI), ``ops``."""
