"""Model presets in the schema the Go service reads too (presets/*.json; Go's
TestPresetsMatchTrainer fails when its copy drifts)."""

import json
import os

import pytest

from mmfeed_trainer.models import config
from mmfeed_trainer.models.model import MMModel


def test_presets_load_with_their_sizes():
    assert config.preset_names() == ["base", "base-8h", "tiny"]
    b8 = config.model_config("base-8h")
    assert (b8.vision_hidden, b8.patch_size, b8.text_hidden, b8.fusion_hidden, b8.fusion_heads) == (768, 16, 768, 768, 8)
    assert config.model_config("base").fusion_heads == 12
    assert (config.tiny().vocab_size, config.tiny().pad_token_id) == (30522, 0)


def test_a_model_file_builds_the_model(tmp_path):
    doc = json.load(open(os.path.join(config.PRESET_DIR, "tiny.json")))
    doc.update(patch_size=14, fusion_heads=8, vocab_size=1000, pad_token_id=3)
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(doc))
    cfg = config.model_config(str(path))
    assert (cfg.patch_size, cfg.fusion_heads, cfg.vocab_size, cfg.pad_token_id) == (14, 8, 1000, 3)
    model = MMModel(cfg)
    assert model.text.tok.num_embeddings == 1000


@pytest.mark.parametrize("edit, match", [({"vison_layers": 2}, "unknown keys"), ({"fusion_heads": 7}, "divisible"),
                                         ({"pad_token_id": 30522}, "pad_token_id")])
def test_bad_model_files_are_refused(tmp_path, edit, match):
    doc = json.load(open(os.path.join(config.PRESET_DIR, "tiny.json")))
    doc.update(edit)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=match):
        config.model_config(str(path))
