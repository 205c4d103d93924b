"""The schema metadata keys the trainer reads come from schema_keys.json (checked against Go by
proto/keys_test.go), and the Go service writes exactly those keys."""

import json
import os

from mmfeed_trainer import keys, synthetic


def test_keys_are_those_of_the_shared_file():
    with open(os.path.join(os.path.dirname(keys.__file__), "schema_keys.json")) as f:
        doc = json.load(f)
    names = {k[len("META_"):].lower(): v for k, v in vars(keys).items() if k.startswith("META_")}
    assert names == doc["schema_metadata"]
    assert keys.SCHEMA_VERSION == doc["schema_version"]


def test_synthetic_records_use_the_shared_keys():
    rec = synthetic.micro_batch(synthetic.SynthConfig(seed=1), 0, 0, 0)
    written = {k.decode() for k in rec.schema.metadata}
    assert written <= set(json.load(open(keys._FILE))["schema_metadata"].values())
