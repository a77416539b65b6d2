"""Policy utilities: loading, rollouts (masks, old log-probs, seeds, stop strings), log-probs, reference, server."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
import torch

from tests.training.tiny import char_tokenizer, save_tiny, tiny_gpt2
from training.generation import GenerationError, GenerationParams, OpenAIGenerator
from training.policy import (
    LoraSettings,
    Reference,
    generate_rollouts,
    load_policy,
    prepare_tokenizer,
    rollout_server,
    token_logprobs,
)
from training.sampling import finish_rows

PROMPTS = ["1+2=", "13+4=", "9+9="]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    tok = char_tokenizer()
    return save_tiny(tiny_gpt2(tok, seed=0), tok, tmp_path_factory.mktemp("tiny"))


def test_load_policy_pads_left_and_disables_dropout(tiny_dir):
    model, tok = load_policy(tiny_dir)
    assert tok.padding_side == "left" and tok.pad_token_id is not None
    assert not model.training


def test_tokenizer_without_pad_uses_eos():
    tok = char_tokenizer()
    tok.pad_token = None
    assert prepare_tokenizer(tok).pad_token_id == tok.eos_token_id


def test_rollouts_layout_and_old_logprobs_match_a_forward_pass(tiny_dir):
    model, tok = load_policy(tiny_dir)
    r = generate_rollouts(model, tok, PROMPTS, n=4, temperature=0.7, max_new_tokens=6, seed=0)
    assert len(r) == 12 and r.prompt_index.tolist() == [0] * 4 + [1] * 4 + [2] * 4
    assert r.prompts[4] == "13+4=" and len(r.texts) == 12
    # left padding: the shorter prompts start with pad, the longest does not
    assert r.prompt_mask[0].tolist() == [0, 1, 1, 1, 1] and r.prompt_mask[4].all()
    logp, entropy = token_logprobs(model, r.input_ids, r.attention_mask, r.response_mask, temperature=0.7,
                                   with_entropy=True)
    assert torch.allclose(logp, r.old_logp, atol=1e-5)
    assert (logp <= 0).all() and entropy.shape == logp.shape and (entropy[r.response_mask.bool()] > 0).all()


def test_logprobs_do_not_depend_on_padding(tiny_dir):
    model, tok = load_policy(tiny_dir)
    r = generate_rollouts(model, tok, PROMPTS, n=1, max_new_tokens=5, seed=1)
    batched, _ = token_logprobs(model, r.input_ids, r.attention_mask, r.response_mask)
    alone = r.select([0])  # trims the padding column the batch needed
    single, _ = token_logprobs(model, alone.input_ids, alone.attention_mask, alone.response_mask)
    assert alone.prompt_ids.shape[1] == 4
    assert torch.allclose(batched[0, : single.shape[1]], single[0], atol=1e-5)


def test_seeded_rollouts_repeat_and_leave_global_rng_alone(tiny_dir):
    model, tok = load_policy(tiny_dir)
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    a = generate_rollouts(model, tok, PROMPTS, n=3, max_new_tokens=6, seed=7)
    after = torch.rand(1)
    b = generate_rollouts(model, tok, PROMPTS, n=3, max_new_tokens=6, seed=7)
    c = generate_rollouts(model, tok, PROMPTS, n=3, max_new_tokens=6, seed=8)
    assert torch.equal(a.response_ids, b.response_ids) and a.texts == b.texts
    assert not torch.equal(a.response_ids, c.response_ids)
    assert before == after


def test_greedy_is_deterministic_without_seed(tiny_dir):
    model, tok = load_policy(tiny_dir)
    a = generate_rollouts(model, tok, PROMPTS, n=2, max_new_tokens=5, greedy=True)
    assert a.texts[0] == a.texts[1]


def test_mask_runs_through_first_eos_and_stop_strings_cut():
    tok = char_tokenizer()
    eos, pad = tok.eos_token_id, tok.pad_token_id
    ids = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    rows = torch.tensor([
        ids("12") + [eos, pad, pad, pad],     # ended by EOS after 2 tokens
        ids("12345a"),                        # ran out of tokens
        ids("1") + ids("\n") + ids("2345"),   # stop string "\n" after 2 tokens
    ])
    mask, ended, texts = finish_rows(tok, rows, stop=["\n"])
    assert mask.sum(1).tolist() == [3, 6, 2]
    assert ended.tolist() == [True, False, True]
    assert texts == ["12", "12345a", "1"]


def test_reference_is_frozen_and_resets(tiny_dir):
    model, tok = load_policy(tiny_dir)
    ref = Reference(model)
    r = generate_rollouts(model, tok, PROMPTS, n=2, max_new_tokens=4, seed=0)
    before = ref.logprobs(r.input_ids, r.attention_mask, r.response_mask)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    assert torch.equal(ref.logprobs(r.input_ids, r.attention_mask, r.response_mask), before)
    assert all(not p.requires_grad for p in ref.model.parameters())
    ref.reset(model)
    now, _ = token_logprobs(model, r.input_ids, r.attention_mask, r.response_mask)
    assert torch.allclose(ref.logprobs(r.input_ids, r.attention_mask, r.response_mask), now)


def test_lora_reference_is_the_base_then_a_snapshot(tiny_dir):
    base, tok = load_policy(tiny_dir)
    model, _ = load_policy(tiny_dir, lora=LoraSettings(r=4, alpha=8))
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    r = generate_rollouts(model, tok, PROMPTS, n=2, max_new_tokens=4, seed=0)
    args = (r.input_ids, r.attention_mask, r.response_mask)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.add_(0.5)
    ref = Reference(model)
    base_logp, _ = token_logprobs(base, *args)
    policy_logp, _ = token_logprobs(model, *args)
    assert torch.allclose(ref.logprobs(*args), base_logp, atol=1e-6)
    assert not torch.allclose(policy_logp, base_logp, atol=1e-3)
    ref.reset(model)  # π_ref ← π_θ: the adapter snapshot, swapped in only while scoring
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.mul_(-1.0)
    assert torch.allclose(ref.logprobs(*args), policy_logp, atol=1e-5)
    assert not torch.allclose(token_logprobs(model, *args)[0], policy_logp, atol=1e-3)


def test_lora_settings_validate():
    with pytest.raises(ValueError, match="lora r"):
        LoraSettings(r=0)
    with pytest.raises(ValueError, match="base_url"):
        rollout_server(base_url="localhost:8000", model="m")


def _send_json(handler: BaseHTTPRequestHandler, status: int, payload: bytes) -> None:
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(payload)))
    handler.end_headers()
    handler.wfile.write(payload)


class _Completions(BaseHTTPRequestHandler):
    """One prompt per request (as OpenAIGenerator sends them): sample 0 of prompt i is str(i) and finished,
    the others run out of tokens."""

    requests: list[dict] = []

    def do_POST(self):  # noqa: N802 - http.server's naming
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append({"path": self.path, "body": body})
        i = PROMPTS.index(body["prompt"])
        choices = [{"index": j, "text": str(i + j) if j == 0 else "99999999",
                    "finish_reason": "stop" if j == 0 else "length"} for j in range(body["n"])]
        _send_json(self, 200, json.dumps({"choices": choices}).encode())

    def log_message(self, *args):
        pass


def test_server_rollouts_are_scored_by_the_local_model(tiny_dir):
    model, tok = load_policy(tiny_dir)
    server = HTTPServer(("127.0.0.1", 0), _Completions)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        gen = rollout_server(base_url=f"http://127.0.0.1:{server.server_port}/v1", model="policy")
        r = generate_rollouts(model, tok, PROMPTS[:2], n=2, max_new_tokens=4, temperature=0.5, server=gen, seed=3)
    finally:
        server.shutdown()
    request = _Completions.requests[-1]
    assert request["path"] == "/v1/completions"
    assert request["body"] | {"prompt": None} == {"model": "policy", "prompt": None, "n": 2, "temperature": 0.5,
                                                  "top_p": 1.0, "max_tokens": 4, "seed": 3}
    assert r.texts == ["0", "99999999", "1", "99999999"]
    assert r.ended.tolist() == [True, False, True, False]
    # "0" + EOS, and the unfinished text cut at max_new_tokens
    assert r.response_mask.sum(1).tolist() == [2, 4, 2, 4]
    logp, _ = token_logprobs(model, r.input_ids, r.attention_mask, r.response_mask, temperature=0.5)
    assert torch.allclose(logp, r.old_logp, atol=1e-5)


def test_server_rollouts_refuse_a_chat_api_server(tiny_dir):
    # the prompt is sent rendered; a chat API would template it a second time
    model, tok = load_policy(tiny_dir)
    chat = OpenAIGenerator("http://127.0.0.1:9/v1", "policy")  # refused before anything is sent
    with pytest.raises(ValueError, match='api="completions"'):
        generate_rollouts(model, tok, PROMPTS, max_new_tokens=4, server=chat)


# --- seeds per row, EOS ids, stop strings, server errors ---------------------------------------


def test_a_rows_sample_does_not_depend_on_the_rest_of_the_batch(tiny_dir):
    # sample j of prompt i is drawn from the stream (seed, global prompt index, j): a process that takes
    # prompts 1..2 of a global batch (prompt_offset=1) samples exactly the rows one process samples for them
    model, tok = load_policy(tiny_dir)
    whole = generate_rollouts(model, tok, PROMPTS, n=3, max_new_tokens=6, seed=11)
    tail = generate_rollouts(model, tok, PROMPTS[1:], n=3, max_new_tokens=6, seed=11, prompt_offset=1)
    one_by_one = generate_rollouts(model, tok, PROMPTS, n=3, max_new_tokens=6, seed=11, batch_size=1)
    assert tail.texts == whole.texts[3:] and one_by_one.texts == whole.texts
    assert torch.allclose(tail.old_logp, whole.old_logp[3:, :tail.old_logp.shape[1]], atol=1e-5)
    assert len(set(whole.texts[:3])) > 1  # the samples of one prompt differ from each other


def _always(tok, token: str, seed: int = 0):
    """A tiny GPT-2 that emits `token` at every step: ln_f outputs a constant, and only that token's (tied)
    embedding has a component along it."""
    model = tiny_gpt2(tok, seed=seed)
    target = tok.convert_tokens_to_ids(token)
    with torch.no_grad():
        model.transformer.ln_f.weight.zero_()
        model.transformer.ln_f.bias.zero_()
        model.transformer.ln_f.bias[0] = 1.0
        model.transformer.wte.weight[:, 0] = 0.0
        model.transformer.wte.weight[target, 0] = 50.0
    return model.eval()


def test_stop_strings_are_matched_on_text_not_on_special_tokens():
    # "<unk>" contains an "n", but the text has no "n": transformers' stop_strings would end every sample here
    tok = prepare_tokenizer(char_tokenizer())
    model = _always(tok, "<unk>")
    r = generate_rollouts(model, tok, PROMPTS, n=2, max_new_tokens=5, seed=0, stop=["n"])
    assert r.response_mask.sum(1).tolist() == [5] * 6 and not r.ended.any()
    assert r.response_ids[0].tolist() == [tok.unk_token_id] * 5 and r.texts == [""] * 6


def test_every_eos_id_of_the_generation_config_ends_a_response():
    tok = prepare_tokenizer(char_tokenizer())
    model = _always(tok, "x")
    x = tok.convert_tokens_to_ids("x")
    model.generation_config.eos_token_id = [tok.eos_token_id, x]  # e.g. Llama 3's <|end_of_text|>, <|eot_id|>
    r = generate_rollouts(model, tok, PROMPTS, n=2, max_new_tokens=5, seed=0)
    assert r.ended.all() and r.response_mask.sum(1).tolist() == [1] * 6
    assert r.response_ids[:, 0].tolist() == [x] * 6 and r.texts == ["x"] * 6
    # the mask helper takes the same list: "x" ends the row, the tokenizer's EOS alone would not
    mask, ended, _ = finish_rows(tok, torch.tensor([[x, x, x]]), None, [tok.eos_token_id, x])
    assert mask.tolist() == [[1, 0, 0]] and ended.tolist() == [True]


class _Failing(BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers["Content-Length"]))
        _send_json(self, 500, b'{"error": "internal: token sk-secret-123 at /srv/models/policy"}')

    def log_message(self, *args):
        pass


def test_server_errors_give_the_status_not_the_remote_body():
    server = HTTPServer(("127.0.0.1", 0), _Failing)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        # rollout_server's generator, without its retries so the test does not wait out the backoff
        gen = OpenAIGenerator(f"http://127.0.0.1:{server.server_port}/v1", "policy", api="completions",
                              max_retries=0)
        with pytest.raises(GenerationError) as caught:
            gen.generate(["1+1="], 1, GenerationParams(max_new_tokens=2))
    finally:
        server.shutdown()
    message = str(caught.value)
    assert "500" in message and "sk-secret" not in message and "/srv/models" not in message


def test_kv_cache_decoding_matches_transformers_generate_greedily(tiny_dir):
    # the sampling loop reads each prompt once and repeats its cache; greedy, it must pick generate()'s tokens
    model, tok = load_policy(tiny_dir)
    ours = generate_rollouts(model, tok, PROMPTS, n=2, max_new_tokens=6, greedy=True)
    enc = tok(PROMPTS, return_tensors="pt", padding=True, add_special_tokens=False)
    theirs = model.generate(**enc, do_sample=False, max_new_tokens=6, pad_token_id=tok.pad_token_id,
                            eos_token_id=tok.eos_token_id)[:, enc["input_ids"].shape[1]:]
    for i in range(len(PROMPTS)):
        length = int(ours.response_mask[2 * i].sum())
        assert ours.response_ids[2 * i, :length].tolist() == theirs[i, :length].tolist()
        assert torch.equal(ours.response_ids[2 * i], ours.response_ids[2 * i + 1])


def test_gpt2_gelu_runs_fused_with_the_same_outputs(tiny_dir):
    from transformers import AutoModelForCausalLM
    from transformers.activations import GELUTanh

    model, tok = load_policy(tiny_dir)
    plain = AutoModelForCausalLM.from_pretrained(tiny_dir).eval()
    assert all(isinstance(block.mlp.act, GELUTanh) for block in model.transformer.h)
    ids = tok(PROMPTS[:1], return_tensors="pt", add_special_tokens=False)["input_ids"]
    assert torch.allclose(model(ids).logits, plain(ids).logits, atol=1e-5)
