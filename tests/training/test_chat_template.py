"""An instruct model sees its prompts through its chat template, the same token ids wherever it meets them: the
app's sampler, GRPO's rollouts and GRPO's loss, and the prompts of SFT and DPO examples. `use_chat_template =
false` shows a base model its prompts as they are, and saves it without a template."""

from __future__ import annotations

import pytest
import torch

from tests.training.tiny import char_tokenizer, save_tiny, tiny_gpt2
from training.causal_lm import encode_examples
from training.config import DPOConfig, GRPOConfig, SFTConfig
from training.data import PromptRow, SFTRow
from training.generation import GenerationParams, HFGenerator
from training.grpo import GRPOTrainer
from training.policy import generate_rollouts, load_policy, prepare_tokenizer
from training.rewards import RewardFunction
from training.sampling import render_prompt
from training.sft import SFTTrainer

pytestmark = pytest.mark.usefixtures("one_thread")

TEMPLATE = ("{% for m in messages %}{{ m['role'][0] }}:{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}a:{% endif %}")
PROMPT = "2+3="


def _chat_model(seed: int = 0):  # type: ignore[no-untyped-def]
    tok = prepare_tokenizer(char_tokenizer())
    tok.chat_template = TEMPLATE
    return tiny_gpt2(tok, seed=seed), tok


def _templated_ids(tok, prompt: str) -> list[int]:  # type: ignore[no-untyped-def]
    return list(tok.apply_chat_template([{"role": "user", "content": prompt}], tokenize=True,
                                        add_generation_prompt=True, return_dict=True)["input_ids"])


def _any_reward() -> list[RewardFunction]:
    """A reward that tells different answers apart, so one GRPO step has advantages to follow."""
    return [RewardFunction("codes", lambda prompts, completions, **_: [float(sum(map(ord, c))) for c in completions])]


class _InputIds:
    """Every input_ids a model is called with over a whole sequence (a prefill or a loss pass, not a cached step)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.calls: list[torch.Tensor] = []
        self._hook = model.register_forward_pre_hook(self._record, with_kwargs=True)

    def _record(self, _module, args, kwargs):  # type: ignore[no-untyped-def]
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is not None and ids.shape[1] > 1:
            self.calls.append(ids.detach().cpu())

    def remove(self) -> None:
        self._hook.remove()


def _assert_prompt_ids_everywhere(model, tok, model_dir, prompt: str, expected: list[int]) -> None:  # type: ignore[no-untyped-def]
    """The app's sampler (on `model_dir`, a saved copy of `model`), GRPO's rollouts and loss passes, and SFT/DPO
    examples all start from `expected`."""
    p = len(expected)
    generator = HFGenerator(model_dir, device="cpu")
    text, templated = generator.render(prompt)
    assert templated and text == render_prompt(tok, prompt)
    assert generator._tokenizer(text, add_special_tokens=not templated)["input_ids"] == expected
    sample = generator.generate([prompt], 1, GenerationParams(max_new_tokens=2, seed=0))[0][0]
    assert sample.prompt_tokens == p

    rollouts = generate_rollouts(model, tok, [prompt], n=2, max_new_tokens=3, seed=0)
    assert rollouts.prompt_ids[:, -p:].tolist() == [expected, expected] and rollouts.prompt_mask.sum(1).tolist() == [p, p]

    for example in encode_examples(tok, [prompt, [{"role": "user", "content": prompt}]], ["5", "5"], max_length=64):
        assert example.prompt == expected  # SFT and DPO: a string and the same one-turn chat alike

    config = GRPOConfig(group_size=4, prompts_per_step=1, max_new_tokens=3, lr=1e-3, beta=0.04, steps=1, seed=0,
                        mixed_precision="no")
    trainer = GRPOTrainer(config, model, tok, _any_reward(), [PromptRow(prompt=prompt)])
    before = {n: t.detach().clone() for n, t in model.named_parameters()}
    seen = _InputIds(model)
    try:
        trainer.step()
    finally:
        seen.remove()
    assert seen.calls, "no full-sequence forward was seen"
    for ids in seen.calls:  # the rollout's prefill, the reference's and the policy's loss passes
        assert ids[:, :p].tolist() == [expected] * ids.shape[0]
    assert any(not torch.equal(t, before[n]) for n, t in model.named_parameters())


def test_a_prompt_is_the_same_token_ids_in_sampling_rollouts_and_the_loss(tmp_path):
    model, tok = _chat_model()
    expected = _templated_ids(tok, PROMPT)
    assert tok.decode(expected) == "u:2+3=\na:"
    _assert_prompt_ids_everywhere(model, tok, save_tiny(model, tok, tmp_path / "model"), PROMPT, expected)


def test_a_base_model_run_shows_prompts_as_they_are_and_saves_no_template(tmp_path):
    model, tok = _chat_model()
    rows = [SFTRow(prompt=PROMPT, completion="5"), SFTRow(prompt=[{"role": "user", "content": "1+1="}], completion="2")]
    trainer = SFTTrainer(SFTConfig(use_chat_template=False, steps=1, batch_size=2, mixed_precision="no"), rows,
                         model=model, tokenizer=tok)
    assert trainer.tokenizer.chat_template is None
    assert trainer.train_examples[0].prompt == tok(PROMPT, add_special_tokens=False)["input_ids"]
    assert tok.decode(trainer.train_examples[1].prompt) == "user: 1+1=\nassistant: "

    model, tok = _chat_model()
    GRPOTrainer(GRPOConfig(use_chat_template=False, group_size=2, prompts_per_step=1), model, tok,
                _any_reward(), [PromptRow(prompt=PROMPT)])
    rollouts = generate_rollouts(model, tok, [PROMPT], n=1, max_new_tokens=1, seed=0)
    assert rollouts.prompt_ids.tolist() == [tok(PROMPT, add_special_tokens=False)["input_ids"]]
    saved = save_tiny(model, tok, tmp_path / "base")
    assert HFGenerator(saved).render(PROMPT) == (PROMPT, False)  # sampling it later sees what training showed it


def test_use_chat_template_defaults_on_for_every_method_that_trains_a_causal_lm():
    assert SFTConfig().use_chat_template and DPOConfig().use_chat_template and GRPOConfig().use_chat_template
    with pytest.raises(ValueError, match="no chat template"):
        render_prompt(prepare_tokenizer(char_tokenizer()), PROMPT, use_chat_template=True)


@pytest.mark.slow
def test_smollm2_sees_its_chat_template_in_sampling_rollouts_and_the_loss_and_one_grpo_step_updates_it(smollm2):
    model, tok = load_policy(smollm2)
    question = "Natalia sold clips to 48 of her friends in April, and then half as many in May. How many in all?"
    expected = _templated_ids(tok, question)
    assert tok.decode(expected).endswith(f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n")
    _assert_prompt_ids_everywhere(model, tok, smollm2, question, expected)
