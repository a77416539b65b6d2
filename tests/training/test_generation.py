"""Generation backends: the hf backend on a tiny GPT-2 saved to disk, the openai backend against a real
HTTP server that samples from that model, spec validation, and the diversity measures."""

from __future__ import annotations

import json
import time
from dataclasses import replace

import pytest
import torch

from tests.support.openai_server import OpenAICompatibleServer
from tests.training.tiny import char_tokenizer, save_tiny, tiny_gpt2
from training.generation import (
    GenerationCancelled,
    GenerationError,
    GenerationParams,
    HFGenerator,
    OpenAIGenerator,
    SpecError,
    diversity,
    from_spec,
    make_generator,
    near_duplicates,
)

PROMPTS = ["1+2=", "hello there, ", "9+9="]
KEY = "sk-test-secret-0123"
# one character per token, so rendered lengths are easy to count
TEMPLATE = ("{% for m in messages %}{{ m['role'][0] }}:{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}a:{% endif %}")


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    # a 64-wide model spends its time in thread hand-offs, not arithmetic, when cores are shared
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    tok = char_tokenizer()
    return save_tiny(tiny_gpt2(tok, seed=0, n_positions=64), tok, tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def chat_dir(tmp_path_factory):
    tok = char_tokenizer()
    tok.chat_template = TEMPLATE
    return save_tiny(tiny_gpt2(tok, seed=0, n_positions=64), tok, tmp_path_factory.mktemp("chat"))


@pytest.fixture(scope="module")
def hf(tiny_dir):
    generator = HFGenerator(tiny_dir, batch_size=4)
    yield generator
    generator.close()


def texts(samples):
    return [[s.text for s in group] for group in samples]


# ------------------------------------------------------------------------------------------------ hf


def test_hf_gives_k_samples_per_prompt_with_their_seeds(hf):
    params = GenerationParams(max_new_tokens=8, seed=11)
    out = hf.generate(PROMPTS, 3, params)
    assert [len(group) for group in out] == [3, 3, 3]
    assert [[s.seed for s in group] for group in out] == [[11, 12, 13]] * 3
    assert [s.prompt_tokens for s in (group[0] for group in out)] == [4, 13, 4]  # one token per character
    for sample in (s for group in out for s in group):
        assert sample.finish_reason in ("stop", "length")
        assert 1 <= sample.completion_tokens <= 8
        if sample.finish_reason == "length":
            assert sample.completion_tokens == 8


def test_hf_same_seed_same_text_and_other_seed_other_text(hf):
    params = GenerationParams(max_new_tokens=12, seed=5)
    first = texts(hf.generate(PROMPTS, 2, params))
    assert texts(hf.generate(PROMPTS, 2, params)) == first
    other = texts(hf.generate(PROMPTS, 2, replace(params, seed=6)))
    # a random 2-layer model over 77 tokens: 12 tokens agreeing by chance is vanishingly unlikely
    assert other[0][0] != first[0][0] and other[0][0] == first[0][1]  # sample i draws with seed + i


def test_hf_samples_do_not_depend_on_batching_or_company(tiny_dir, hf):
    params = GenerationParams(max_new_tokens=10, seed=3, temperature=0.8)
    together = hf.generate(PROMPTS, 2, params)
    one_by_one = HFGenerator(tiny_dir, batch_size=1)
    assert texts(one_by_one.generate(PROMPTS, 2, params)) == texts(together)
    # a recorded sample is reproduced from its own seed, alone
    sample = together[2][1]
    assert texts(hf.generate([PROMPTS[2]], 1, replace(params, seed=sample.seed))) == [[sample.text]]


def test_hf_without_seed_records_one_that_reproduces(hf):
    params = GenerationParams(max_new_tokens=10)
    sample = hf.generate(["1+2="], 1, params)[0][0]
    assert isinstance(sample.seed, int)
    assert hf.generate(["1+2="], 1, replace(params, seed=sample.seed))[0][0].text == sample.text


def test_hf_greedy_and_top_p(hf):
    greedy = texts(hf.generate(["1+2="], 3, GenerationParams(max_new_tokens=6, temperature=0)))[0]
    assert len(set(greedy)) == 1
    # top_p this small keeps only the most likely token: nucleus sampling becomes greedy
    assert texts(hf.generate(["1+2="], 2, GenerationParams(max_new_tokens=6, top_p=1e-6, seed=1)))[0] == greedy[:2]


def test_hf_stop_strings_cut_the_text(hf):
    params = GenerationParams(max_new_tokens=40, seed=0, temperature=1.0)
    free = [s for group in hf.generate(PROMPTS, 4, params) for s in group]
    # choose a stop string from what the model actually says, so the cut is exercised
    long = next(s for s in free if len(s.text) >= 6)
    stop = long.text[3:5]
    stopped = [s for group in hf.generate(PROMPTS, 4, replace(params, stop=[stop])) for s in group]
    assert stopped and all(stop not in s.text for s in stopped)
    cut = [s for s in stopped if s.finish_reason == "stop" and s.completion_tokens < 40]
    assert cut, "the stop string never ended a sample"
    for before, after in zip(free, stopped, strict=True):
        # same seed: the stopped text is the free text up to the stop string
        assert before.text.startswith(after.text)
        if stop in before.text:
            assert after.text == before.text[:before.text.index(stop)]
            assert after.finish_reason == "stop"


def test_hf_chat_template_formats_messages_and_strings(chat_dir):
    generator = HFGenerator(chat_dir)
    messages = [{"role": "system", "content": "add"}, {"role": "user", "content": "1+2"}]
    assert generator.render(messages) == ("s:add\nu:1+2\na:", True)
    assert generator.render("1+2") == ("u:1+2\na:", True)
    params = GenerationParams(max_new_tokens=6, seed=2)
    as_chat = generator.generate([[{"role": "user", "content": "1+2"}]], 2, params)
    as_text = generator.generate(["1+2"], 2, params)
    assert texts(as_chat) == texts(as_text)
    assert as_chat[0][0].prompt_tokens == len("u:1+2\na:")
    plain = HFGenerator(chat_dir, use_chat_template=False)
    assert plain.render("1+2") == ("1+2", False)
    assert plain.render(messages) == ("system: add\nuser: 1+2\nassistant: ", False)


def test_hf_prefixes_are_continued_as_if_they_ended_the_prompt(hf, chat_dir):
    params = GenerationParams(max_new_tokens=6, seed=9)
    continued = hf.generate(["1+2=", "9+9="], 3, params, prefixes=["3\n", ""])
    # Without a chat template the prompt is used as it is: a prefix is more prompt, sampled from the same streams.
    assert texts(continued) == texts(hf.generate(["1+2=3\n", "9+9="], 3, params))
    # With one, the prefix goes after the generation prompt, inside the answer it starts.
    chat, plain = HFGenerator(chat_dir), HFGenerator(chat_dir, use_chat_template=False)
    assert texts(chat.generate(["1+2="], 2, params, prefixes=["3"])) == texts(plain.generate(["u:1+2=\na:3"], 2, params))
    with pytest.raises(GenerationError, match="one string per prompt"):
        hf.generate(["1+2=", "9+9="], 1, params, prefixes=["3"])


def test_hf_progress_and_stop_between_batches(tiny_dir):
    generator = HFGenerator(tiny_dir, batch_size=2)
    seen = []
    generator.generate(PROMPTS, 2, GenerationParams(max_new_tokens=4, seed=0), progress=lambda d, t: seen.append((d, t)))
    assert seen == [(2, 6), (4, 6), (6, 6)]
    calls = []

    def stop_after_two_batches() -> bool:
        calls.append(1)
        return len(calls) > 2

    with pytest.raises(GenerationCancelled) as info:
        generator.generate(PROMPTS, 2, GenerationParams(max_new_tokens=4, seed=0), should_stop=stop_after_two_batches)
    assert sorted(info.value.completed) == [0, 1]
    assert all(len(group) == 2 for group in info.value.completed.values())


def test_hf_missing_directory(tmp_path):
    generator = make_generator({"backend": "hf", "model": str(tmp_path / "nope")})
    with pytest.raises(GenerationError, match="does not exist"):
        generator.check()
    with pytest.raises(GenerationError, match="does not exist"):
        generator.generate(["x"], 1, GenerationParams())


def test_hf_directory_without_weights(tmp_path, tiny_dir):
    (tmp_path / "config.json").write_text((tiny_dir / "config.json").read_text())
    with pytest.raises(GenerationError, match="has no weights"):
        HFGenerator(tmp_path).check()
    (tmp_path / "config.json").unlink()
    with pytest.raises(GenerationError, match="no config.json"):
        HFGenerator(tmp_path).check()


def test_hf_prompt_longer_than_context_names_the_prompt(hf):
    with pytest.raises(GenerationError, match=r"prompt 1 is 60 tokens; with max_new_tokens=8 .* context is 64"):
        hf.generate(["1+2=", "1" * 60], 1, GenerationParams(max_new_tokens=8))


def test_hf_n_above_max_k(tiny_dir):
    with pytest.raises(GenerationError, match=r"n=5 .*max_k=4"):
        HFGenerator(tiny_dir, max_k=4).generate(["1+2="], 5, GenerationParams())


def test_hf_describe_records_model_and_params(hf, tiny_dir):
    params = GenerationParams(temperature=0.7, top_p=0.9, max_new_tokens=8, seed=1, stop=["\n"])
    described = hf.describe(params)
    assert described["backend"] == "hf" and described["model"] == str(tiny_dir.resolve())
    assert described["params"] == {"temperature": 0.7, "top_p": 0.9, "max_new_tokens": 8, "seed": 1, "stop": ["\n"]}
    assert len(described["fingerprint"]) == 16
    json.dumps(described)
    assert hf.name == f"hf:{tiny_dir.name}"


# -------------------------------------------------------------------------------------------- openai


@pytest.fixture(scope="module")
def server(tiny_dir):
    with OpenAICompatibleServer(tiny_dir, model_name="tiny", api_key=KEY, max_n=2) as srv:
        yield srv


@pytest.fixture
def fresh(server):
    """The shared server with no faults queued and its request log emptied."""
    server.clear_faults()
    deadline = time.monotonic() + 5
    while server.in_flight and time.monotonic() < deadline:  # a timed-out request may still be sleeping
        time.sleep(0.05)
    server.requests.clear()
    server.max_in_flight = 0
    yield server
    server.clear_faults()


def remote(server, **options) -> OpenAIGenerator:
    spec = {"backend": "openai", "base_url": server.url, "model": "tiny", "api_key": KEY, "max_n": 2,
            "backoff_s": 0.01, **options}
    return make_generator(spec)


def test_openai_completions_match_local_sampling(fresh, hf):
    params = GenerationParams(max_new_tokens=8, seed=21)
    client = remote(fresh, api="completions")
    out = client.generate(PROMPTS[:2], 2, params)
    # the server samples with the hf backend: same model, prompt and seeds → the same texts
    assert texts(out) == texts(hf.generate(PROMPTS[:2], 2, params))
    assert out[0][0].prompt_tokens == 4 and out[0][0].seed == 21
    assert fresh.request_count == 2 and [r["n"] for r in fresh.requests] == [2, 2]
    assert fresh.requests[0]["max_tokens"] == 8 and fresh.requests[0]["seed"] == 21


def test_openai_chat_sends_messages(fresh, hf):
    params = GenerationParams(max_new_tokens=6, seed=4, stop=["\n"])
    messages = [{"role": "user", "content": "1+2="}]
    out = remote(fresh).generate([messages, "9+9="], 1, params)
    sent = sorted((r["messages"] for r in fresh.requests), key=lambda m: m[0]["content"])
    assert sent == [messages, [{"role": "user", "content": "9+9="}]]  # a string becomes one user turn
    assert all(r["stop"] == ["\n"] for r in fresh.requests)
    assert texts(out) == texts(hf.generate([messages, [{"role": "user", "content": "9+9="}]], 1, params))
    assert out[0][0].completion_tokens is not None  # n=1: usage is this sample's own


def test_openai_splits_n_over_requests_above_max_n(fresh, hf):
    params = GenerationParams(max_new_tokens=6, seed=100)
    out = remote(fresh, api="completions").generate(["1+2="], 5, params)
    # n=5 with max_n=2: requests for samples [0,2), [2,4), [4,5), each seeded with seed + first index
    assert sorted((r["n"], r["seed"]) for r in fresh.requests) == [(1, 104), (2, 100), (2, 102)]
    assert [s.seed for s in out[0]] == [100, 100, 102, 102, 104]
    assert texts(out) == texts(hf.generate(["1+2="], 5, params))


def test_a_server_that_ignores_n_is_detected_on_the_first_request_and_sampled_one_by_one(tiny_dir, hf):
    """transformers' `serve` answers one choice whatever n asks: the first request goes alone, its one choice is
    kept, and every later request asks for one sample, seeded as its position, so the texts are those of local
    sampling with the same seed."""
    params = GenerationParams(max_new_tokens=6, seed=40)
    with OpenAICompatibleServer(tiny_dir, model_name="tiny", ignore_n=True) as srv:
        client = make_generator({"backend": "openai", "base_url": srv.url, "model": "tiny", "api": "completions",
                                 "concurrency": 8})
        out = client.generate(PROMPTS[:2], 4, params)
        assert texts(out) == texts(hf.generate(PROMPTS[:2], 4, params))
        assert srv.requests[0]["n"] == 4 and [r["n"] for r in srv.requests[1:]] == [1] * 7  # 1 + 3 + 4 requests
        assert client.n_cap == 1 and client.n_cap_seen == (4, 1)
        assert sorted(r["seed"] for r in srv.requests if r["prompt"] == PROMPTS[1]) == [40, 41, 42, 43]
        srv.requests.clear()
        client.generate(PROMPTS[:1], 3, params)  # the cap is remembered: no request asks for more than one
        assert [r["n"] for r in srv.requests] == [1, 1, 1]


def test_openai_server_cap_above_max_n_is_a_clear_error(fresh):
    with pytest.raises(GenerationError, match="HTTP 400") as info:
        remote(fresh, max_n=4).generate(["1+2="], 4, GenerationParams(max_new_tokens=4))
    assert "SERVER-BODY" not in str(info.value) and "n must be" not in str(info.value)


def test_openai_retries_429_after_retry_after(fresh):
    fresh.fail_next(429, times=1, retry_after=1)
    started = time.monotonic()
    out = remote(fresh, max_retries=2).generate(["1+2="], 1, GenerationParams(max_new_tokens=4, seed=1))
    assert time.monotonic() - started >= 0.95  # backoff_s=0.01 would not wait this long: Retry-After did
    assert fresh.request_count == 2 and len(out[0]) == 1


def test_openai_5xx_exhausts_retries(fresh):
    fresh.fail_always(500)
    with pytest.raises(GenerationError, match=r"HTTP 500 \(3 attempts\)") as info:
        remote(fresh, max_retries=2).generate(["1+2="], 1, GenerationParams(max_new_tokens=4))
    assert fresh.request_count == 3 and "SERVER-BODY" not in str(info.value)


def test_openai_timeout(fresh):
    fresh.sleep_next(1.0)
    with pytest.raises(GenerationError, match="timed out after 0.3 s"):
        remote(fresh, timeout_s=0.3, max_retries=0).generate(["1+2="], 1, GenerationParams(max_new_tokens=4))


def test_openai_malformed_json_and_wrong_choice_count(fresh):
    fresh.malformed_next()
    with pytest.raises(GenerationError, match="not JSON") as info:
        remote(fresh).generate(["1+2="], 1, GenerationParams(max_new_tokens=4))
    assert "SERVER-BODY" not in str(info.value) and fresh.request_count == 1  # not retried
    fresh.wrong_choices_next()
    with pytest.raises(GenerationError, match="returned 3 choices for n=2"):
        remote(fresh).generate(["1+2="], 2, GenerationParams(max_new_tokens=4))


def test_openai_unreachable_server():
    closed = OpenAIGenerator("http://127.0.0.1:9/v1", "tiny", max_retries=0, timeout_s=2)
    with pytest.raises(GenerationError, match="could not reach http://127.0.0.1:9/v1/chat/completions"):
        closed.generate(["1+2="], 1, GenerationParams(max_new_tokens=4))


def test_openai_api_key_is_sent_and_never_described(fresh):
    client = remote(fresh)
    client.check(connect=True)
    described = json.dumps(client.describe(GenerationParams()))
    assert KEY not in described and KEY not in repr(client)
    with pytest.raises(GenerationError, match=r"HTTP 401 \(check api_key\)"):
        remote(fresh, api_key="wrong").generate(["1+2="], 1, GenerationParams(max_new_tokens=4))
    with pytest.raises(GenerationError, match="does not list model 'other'"):
        make_generator({"backend": "openai", "base_url": fresh.url, "model": "other", "api_key": KEY}).check(
            connect=True)


def test_openai_concurrency_cap_progress_and_stop(fresh):
    seen = []
    remote(fresh, api="completions", concurrency=2).generate(
        PROMPTS * 2, 1, GenerationParams(max_new_tokens=4, seed=0), progress=lambda d, t: seen.append((d, t)))
    assert fresh.max_in_flight <= 2 and fresh.request_count == 6
    assert [d for d, _ in seen] == [1, 2, 3, 4, 5, 6] and {t for _, t in seen} == {6}
    checks = []
    with pytest.raises(GenerationCancelled) as info:
        remote(fresh, api="completions", concurrency=1).generate(
            PROMPTS, 1, GenerationParams(max_new_tokens=4), should_stop=lambda: checks.append(1) or len(checks) > 2)
    assert sorted(info.value.completed) == [0, 1]


def test_openai_completions_api_refuses_messages(fresh):
    with pytest.raises(GenerationError, match='need api="chat"'):
        remote(fresh, api="completions").generate([[{"role": "user", "content": "x"}]], 1, GenerationParams())


# ------------------------------------------------------------------------------------------- specs


def test_params_validation_names_the_field():
    for bad, field in [({"temperature": -1}, "temperature"), ({"top_p": 0}, "top_p"), ({"top_p": 1.5}, "top_p"),
                       ({"max_new_tokens": 0}, "max_new_tokens"), ({"seed": -3}, "seed"), ({"seed": True}, "seed"),
                       ({"stop": [""]}, "stop"), ({"temperature": "hot"}, "temperature")]:
        with pytest.raises(SpecError) as info:
            GenerationParams(**bad)
        assert info.value.field == field and str(info.value).startswith(field)
        assert isinstance(info.value, ValueError)
    assert GenerationParams(stop="\n").stop == ["\n"]


def test_make_generator_from_specs(tiny_dir):
    generator, params = from_spec({"backend": "hf", "model": str(tiny_dir), "temperature": 0.5, "max_tokens": 9})
    assert isinstance(generator, HFGenerator) and params == GenerationParams(temperature=0.5, max_new_tokens=9)
    remote = make_generator({"backend": "openai", "base_url": "http://gpu-1:8000", "model": "m", "api_key": "sk-x",
                             "api": "completions", "max_n": 4, "concurrency": 2})
    assert isinstance(remote, OpenAIGenerator) and remote.base_url == "http://gpu-1:8000/v1"
    remote.check()  # well formed; nothing is contacted
    for spec, field in [({"backend": "vllm", "model": "m"}, "backend"),
                        ({"backend": "hf", "model": ""}, "model"),
                        ({"backend": "hf", "model": "/m", "base_url": "http://x"}, "base_url"),
                        ({"backend": "hf", "model": "/m", "batch_size": 0}, "batch_size"),
                        ({"backend": "hf", "model": "/m", "device": "tpu"}, "device"),
                        ({"backend": "openai", "model": "m"}, "base_url"),
                        ({"backend": "openai", "base_url": "http://x/v1", "model": "m", "api": "embed"}, "api"),
                        ({"backend": "openai", "base_url": "http://x/v1", "model": "m", "timeout_s": 0}, "timeout_s"),
                        ({"backend": "openai", "base_url": "http://x/v1", "model": "m", "max_n": 0}, "max_n")]:
        with pytest.raises(SpecError) as info:
            make_generator(spec)
        assert info.value.field == field
    for url in ["ftp://x/v1", "http:///v1", "http://user:pw@x/v1", "http://x/v1?a=1"]:
        with pytest.raises(SpecError, match="base_url"):
            make_generator({"backend": "openai", "base_url": url, "model": "m"}).check()


# --------------------------------------------------------------------------------------- diversity


def test_diversity_by_hand():
    # token sets: {the, cat, sat}, {the, cat, ran}, {a, dog}
    # J(1,2) = |{the, cat}| / |{the, cat, sat, ran}| = 2/4; J(1,3) = J(2,3) = 0
    out = diversity(["The cat sat.", "the cat ran", "A dog"])
    assert out == {"distinct": 3, "mean_jaccard": pytest.approx(0.5 / 3), "max_jaccard": 0.5}
    # whitespace-only differences are one text; identical texts have J = 1
    same = diversity(["x  y", "x y", "z"])
    assert same["distinct"] == 2 and same["max_jaccard"] == 1.0 and same["mean_jaccard"] == pytest.approx(1 / 3)
    assert diversity(["only"]) == {"distinct": 1, "mean_jaccard": 0.0, "max_jaccard": 0.0}


def test_near_duplicates_keep_the_first_of_each_group():
    texts_ = ["a b c d e f g h i j", "a b c d e f g h i j k", "x y", "x  y", "a b c"]
    # J(0,1) = 10/11 ≈ 0.909 ≥ 0.9; 3 repeats 2 after whitespace; J(0,4) = 3/10
    assert near_duplicates(texts_) == [1, 3]
    assert near_duplicates(texts_, threshold=0.95) == [3]
    with pytest.raises(ValueError):
        near_duplicates(texts_, threshold=0)


def test_hf_corrupt_weights_are_a_generation_error(tmp_path, tiny_dir):
    for file in tiny_dir.iterdir():
        (tmp_path / file.name).write_bytes(file.read_bytes())
    (tmp_path / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(GenerationError, match="could not load a causal LM"):
        HFGenerator(tmp_path).generate(["1+2="], 1, GenerationParams(max_new_tokens=2))
