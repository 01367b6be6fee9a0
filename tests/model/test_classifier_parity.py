"""Our fine-tuned model (body + task head) against ``transformers.OpenAIGPTDoubleHeadsModel`` with the same weights:
the same head outputs, the same L3 = L2 + λ·L1 loss and the same gradients (paper §3.2). The fine-tuning benchmark
(benchmarks/finetune_throughput.py) compares speed on this correspondence, so it is pinned here."""

from __future__ import annotations

import pytest
import torch

from gptcli.interop.hf import config_to_hf, state_dict_to_hf
from gptcli.model.classifier import FinetuneModel
from gptcli.model.gpt import GPT, ModelConfig
from gptcli.model.heads import HeadConfig, TaskHead
from gptcli.model.losses import lm_loss_per_sequence

transformers = pytest.importorskip("transformers")

CFG = ModelConfig(vocab_size=40, n_special=3, n_ctx=32, n_embd=32, n_layer=2, n_head=2, n_inner=128)
E = 42  # the extract token
LAMBDA = 0.5


def _pair(kind: str, n_labels: int = 2):
    torch.manual_seed(0)
    head = TaskHead(HeadConfig(kind, CFG.n_embd, n_labels=n_labels, extract_id=E))
    ours = FinetuneModel(GPT(CFG), head).eval()
    hf_cfg = transformers.OpenAIGPTConfig(
        **{k: v for k, v in config_to_hf(CFG).items() if k not in ("architectures", "model_type")}
    )
    hf = transformers.OpenAIGPTDoubleHeadsModel(hf_cfg).eval()
    if head.config.n_out != 1:  # entailment: one "choice" per example, scored by an n-class W_y
        hf.multiple_choice_head.summary = torch.nn.Linear(CFG.n_embd, head.config.n_out)
    sd = state_dict_to_hf(ours.gpt.state_dict(), CFG.n_layer)
    sd["multiple_choice_head.summary.weight"] = head.linear.weight
    sd["multiple_choice_head.summary.bias"] = head.linear.bias
    missing, unexpected = hf.load_state_dict({k: v.detach().clone() for k, v in sd.items()}, strict=False)
    assert not missing and not unexpected
    assert hf.lm_head.weight.data_ptr() == hf.transformer.tokens_embed.weight.data_ptr()  # still tied
    return ours, hf


def _ids(n_rows: int, length: int) -> torch.Tensor:
    """Rows ``<s> body <e>`` of one length (no padding, so HF's token-mean LM loss equals our per-sequence mean)."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 40, (n_rows, length), generator=g)
    ids[:, 0], ids[:, -1] = 40, E
    return ids


def _losses(ours, hf, ids: torch.Tensor, n_seqs: int, labels: torch.Tensor):
    out, hidden = ours(ids, n_seqs)
    mask = torch.ones_like(ids, dtype=torch.float32)
    our_loss = ours.head.loss(out, labels) + LAMBDA * lm_loss_per_sequence(hidden, ids, mask, ours.gpt.lm_logits).mean()
    B = ids.size(0) // n_seqs
    x = ids.view(B, n_seqs, -1)
    res = hf(input_ids=x, mc_token_ids=torch.full((B, n_seqs), ids.size(1) - 1), labels=x, mc_labels=labels)
    return out, our_loss, res.mc_logits, res.mc_loss + LAMBDA * res.loss


def _check_grads(ours, hf, our_loss, hf_loss) -> None:
    our_loss.backward()
    hf_loss.backward()
    torch.testing.assert_close(
        ours.head.linear.weight.grad, hf.multiple_choice_head.summary.weight.grad, rtol=1e-4, atol=1e-6
    )
    torch.testing.assert_close(
        ours.gpt.blocks[0].attn.qkv.weight.grad, hf.transformer.h[0].attn.c_attn.weight.grad.t(), rtol=1e-4, atol=1e-6
    )
    torch.testing.assert_close(
        ours.gpt.tok_emb.weight.grad, hf.transformer.tokens_embed.weight.grad, rtol=1e-4, atol=1e-6
    )


def test_multiple_choice_matches_double_heads_model():
    ours, hf = _pair("multiple_choice")
    labels = torch.tensor([0, 1, 1])
    out, our_loss, mc_logits, hf_loss = _losses(ours, hf, _ids(3 * 2, 12), 2, labels)
    torch.testing.assert_close(out, mc_logits, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(our_loss, hf_loss, rtol=1e-5, atol=1e-6)
    _check_grads(ours, hf, our_loss, hf_loss)


def test_entailment_matches_double_heads_model_with_a_two_class_head():
    ours, hf = _pair("entailment", n_labels=2)
    labels = torch.tensor([1, 0, 1, 0])
    out, our_loss, mc_logits, hf_loss = _losses(ours, hf, _ids(4, 10), 1, labels)
    torch.testing.assert_close(out, mc_logits.squeeze(1), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(our_loss, hf_loss, rtol=1e-5, atol=1e-6)
    _check_grads(ours, hf, our_loss, hf_loss)


def test_padding_changes_neither_the_head_output_nor_the_extract_position():
    """Right padding after ``<e>``: our head finds ``<e>`` from the ids, HF is told its position; both agree."""
    ours, hf = _pair("multiple_choice")
    ids = _ids(4, 9)
    padded = torch.cat([ids, torch.zeros(4, 5, dtype=ids.dtype)], 1)
    out, _ = ours(padded, 2)
    res = hf(input_ids=padded.view(2, 2, -1), mc_token_ids=torch.full((2, 2), 8))
    torch.testing.assert_close(out, res.mc_logits, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out, ours(ids, 2)[0], rtol=1e-5, atol=1e-6)
