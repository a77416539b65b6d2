"""Field descriptions are data (dataclass metadata), so a config built without source code still explains itself."""

from __future__ import annotations

import dataclasses

from training.config import TrainConfig, field_docs, setting, setting_factory


def test_descriptions_come_from_metadata_not_from_the_source():
    made = dataclasses.make_dataclass("Made", [
        ("alpha", int, setting(1, "The first   knob,\n  folded onto one line.")),
        ("names", list, setting_factory(list, "A fresh list per config.")),
        ("plain", int, dataclasses.field(default=0)),
    ])
    assert field_docs(made) == {"alpha": "The first knob, folded onto one line.", "names": "A fresh list per config."}
    assert made().names is not made().names


def test_a_subclass_that_redeclares_a_field_without_a_description_keeps_the_base_one():
    @dataclasses.dataclass
    class Longer(TrainConfig):
        steps: int = 500
        lr: float = setting(1e-4, "A larger step for this method.")

    docs = field_docs(Longer)
    assert docs["steps"] == field_docs(TrainConfig)["steps"]
    assert docs["lr"] == "A larger step for this method."
    assert list(docs) == [f.name for f in dataclasses.fields(Longer)]
