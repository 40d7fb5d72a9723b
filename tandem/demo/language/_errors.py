"""What building the language models raises; a branch of the demo's tree::

    tandem.demo.DemoError (RuntimeError)
    ├── LanguageBuildError   the models could not be trained, exported or evaluated
    └── LanguageDemoError    ``tandem demo --llm`` could not run (the hub or the agent did
                             not come up, a turn failed, too little held-out text)

Bad recipes are refused earlier, with ``ValueError``, when they are made.
"""

from __future__ import annotations

from .._errors import DemoError

__all__ = ["LanguageBuildError", "LanguageDemoError"]


class LanguageBuildError(DemoError):
    """The language models could not be trained, exported or evaluated."""


class LanguageDemoError(DemoError):
    """``tandem demo --llm`` could not run: a part did not come up or a turn failed."""
