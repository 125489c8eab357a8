"""Mixture-of-experts support. MoE targets (Qwen3-MoE, Mixtral, OLMoE) already run through the engine with
their own experts; sparse expert selection in the verify pass arrives with the sparse-verification issue."""
