"""Chapter 14's guard against the installed Switch layer, shared by tests/test_moe.py (this suite's
transformers) and tests/test_colab.py (Colab's, run as ``python tests/switch_parity.py`` there).

A confident router at capacity 3 of 13 tokens drops tokens in the course's layer; Hugging Face's
``SwitchTransformersSparseMLP`` computes the same output exactly when its release applies the
per-sequence capacity, which is what ``companion.moe.hf_switch_has_capacity`` claims to know.
"""

from __future__ import annotations

import json


def compare() -> dict[str, bool]:
    """``dropped``: the case drops tokens; ``equal``: HF's layer equals ours; ``guard``: what the guard says."""
    import torch
    import transformers
    from transformers.models.switch_transformers.modeling_switch_transformers import SwitchTransformersSparseMLP

    from companion.moe import from_hf_switch_mlp, hf_switch_has_capacity

    cfg = transformers.SwitchTransformersConfig(d_model=16, d_ff=32, num_experts=4, expert_capacity=3,
                                                dropout_rate=0.0, router_jitter_noise=0.0)
    torch.manual_seed(0)
    hf = SwitchTransformersSparseMLP(cfg).eval()
    with torch.no_grad():
        hf.router.classifier.weight.normal_(0, 1.0)
        ours = from_hf_switch_mlp(hf, capacity=3)
        x = torch.randn(2, 13, 16, generator=torch.Generator().manual_seed(1))
        ref, out = hf(x), ours(x)
    ref = ref[0] if isinstance(ref, tuple) else ref  # a tuple in some releases
    return {"dropped": bool((~ours.last_routing.dispatch.any(-1)).any()),
            "equal": torch.allclose(out, ref, atol=1e-6), "guard": hf_switch_has_capacity()}


if __name__ == "__main__":
    print(json.dumps(compare()))
