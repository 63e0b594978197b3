"""Every claim's number of radio1d, derived from the measurements only (costs seconds to change)."""

from __future__ import annotations

from tasks.common.results import SeedResult
from tasks.radio1d import method
from tasks.radio1d.config import Radio1DConfig


def claim_metrics(cfg: Radio1DConfig, result: SeedResult) -> dict[str, float]:
    m = result.metrics
    if cfg.hub is not None:
        return {}
    ks, k_lo, k_hi = list(cfg.eval.ks), cfg.eval.ks[0], cfg.eval.ks[-1]
    fixed = sorted(cfg.train.fixed_ks)
    full, small = f"fixed{fixed[-1]}", f"fixed{fixed[0]}"
    curve = lambda model, what: [m[f"{model}_{what}_k{k}"] for k in ks]  # noqa: E731
    area = lambda model: method.log_k_area(ks, curve(model, "recon_error"))  # noqa: E731
    probe = lambda model, k: m[f"{model}_probe_map_k{k}"]  # noqa: E731
    out = {
        "teacher_r2_max": max(m["teacher_r2_dense_from_summary"], m["teacher_r2_summary_from_dense"]),
        "teacher_quality_min": min(m["teacher_summary_map"], m["teacher_dense_quadrant_accuracy"]),
        # C3: single token
        "elastic_map_k1_over_kmax": probe("elastic", k_lo) / probe("elastic", k_hi),
        "elastic_minus_full_fixed_map_k1": probe("elastic", k_lo) - probe(full, k_lo),
        "full_fixed_map_drop_k1": probe(full, k_hi) - probe(full, k_lo),
        "elastic_minus_small_fixed_map_k1": probe("elastic", k_lo) - probe(small, k_lo),
        "elastic_minus_plain_map_k1": probe("elastic", k_lo) - probe("plain", k_lo),
        # C4: coarse-to-fine reconstruction
        "elastic_recon_violations": float(method.violations_of_non_increase(curve("elastic", "recon_error"))),
        "elastic_over_full_fixed_recon_area": area("elastic") / area(full),
        "full_fixed_recon_k1_over_kmax": m[f"{full}_recon_error_k{k_lo}"] / m[f"{full}_recon_error_k{k_hi}"],
        "elastic_over_plain_recon_area": area("elastic") / area("plain"),
        "elastic_over_small_fixed_recon_k1": m[f"elastic_recon_error_k{k_lo}"] / m[f"{small}_recon_error_k{k_lo}"],
        # C5: composition retrieval
        "elastic_retrieval_tokens_minus_cls": m["elastic_p_at_1_tokens"] - m["elastic_p_at_1_cls"],
        "elastic_retrieval_cls": m["elastic_p_at_1_cls"],
        "elastic_retrieval_tokens_minus_plain_pooled": m["elastic_p_at_1_tokens"] - m["plain_p_at_1_tokens"],
        "plain_retrieval_pooled": m["plain_p_at_1_tokens"],
    }
    for model in ["elastic", *(f"fixed{k}" for k in fixed), "plain"]:
        out[f"{model}_recon_area"] = area(model)
    return out
