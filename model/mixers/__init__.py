"""Token mixers of their own form: layers that mix tokens without a softmax over keys (linear attention's states),
so they run no kernel and not the attention pipeline, and state their own options and plan terms. Each module
registers its mixer as the package is imported (``model.registry.discover``)."""
