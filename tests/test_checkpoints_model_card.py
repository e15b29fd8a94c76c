"""app/checkpoints/model_card.py: the card states what a checkpoint recorded, whatever types it holds."""

from app.checkpoints.model_card import _data_section


def test_a_data_summary_of_the_wrong_types_reads_dashes_not_a_traceback():
    """A checkpoint from elsewhere may hold anything in its JSON: the card renders it, never formats it blind."""
    config = {"data": {"path": "/x/data", "splits": {"train": {"docs": "many", "examples": None, "tokens": 5,
                                                               "bytes": [1]}, "test": "?"}}}  # fmt: skip
    meta = {
        "source": "not a dict",
        "documents": {"kept": "a few"},
        "max_seq_len": 128,
        "bytes_per_token": "x",
    }
    card = _data_section(config, meta)
    assert "| train | - | - | 5 | - |" in card and "| test | - | - | - | - |" in card, card
    assert (
        "text from not recorded" in card and "- documents kept of - read; examples up to 128 tokens" in card
    )
    assert _data_section({"data": "nonsense"}, None).endswith(
        "The data summary was not recorded with this checkpoint."
    )


def test_the_card_says_why_a_file_became_several_documents_and_the_schedule_in_force():
    from app.checkpoints.model_card import _training_section

    config = {"data": {"path": "d", "splits": {"train": {"docs": 2}}}}
    meta = {"documents": {"kept": 2, "records": 2, "long_documents_cut": {"documents": 1, "parts": 2,
                                                                          "part_chars": 1048576}}}  # fmt: skip
    card = _data_section(config, meta)
    assert (
        "2 of the documents are parts of 1 longer one(s), cut at line ends every 1,048,576 characters" in card
    )
    assert "parts of" not in _data_section(config, {"documents": {"kept": 2, "records": 2}})
    budgeted = {"train": {"warmup_steps": None, "lr_decay": "cosine", "min_lr_ratio": 0.1},
                "schedule": {"warmup_steps": 7, "eval_every": 13, "save_every": 13}}  # fmt: skip
    assert "- schedule: 7 warm-up steps, then cosine decay" in _training_section(budgeted, 130, None)
