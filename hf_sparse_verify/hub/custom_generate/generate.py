"""hf_sparse_verify's custom generate, for ``model.generate(..., custom_generate=<repo or folder>,
trust_remote_code=True)``. It only delegates to the installed ``hf_sparse_verify`` package."""


def generate(model, *args, **kwargs):
    from hf_sparse_verify import generate_from_arguments

    return generate_from_arguments(model, *args, **kwargs)
