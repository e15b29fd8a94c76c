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
