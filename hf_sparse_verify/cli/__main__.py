"""``python -m hf_sparse_verify.cli``: the same as the ``hf-sparse-verify`` command."""

from . import main

raise SystemExit(main())
