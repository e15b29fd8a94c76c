"""Configuration of a multiplicative LSTM language model (Krause et al. 2016) exported by mlstm-ds.

The fields are mlstm-ds's own `ModelConfig` fields, under the same names; `hidden_size` and
`num_hidden_layers` are the usual `transformers` aliases of `hidden_dim` and `num_layers`. A classifier
folder adds what its head reads (`classifier_*`, MultiplicativeLSTMForSequenceClassification), with the
labels in transformers' own `id2label` and `problem_type`.
"""

from typing import ClassVar

from transformers import PretrainedConfig


class MultiplicativeLSTMConfig(PretrainedConfig):
    model_type = "multiplicative_lstm"
    attribute_map: ClassVar[dict] = {"hidden_size": "hidden_dim", "num_hidden_layers": "num_layers"}

    def __init__(
        self,
        vocab_size=256,
        embed_dim=32,
        hidden_dim=64,
        num_layers=2,
        cell="mlstm",
        dropout=0.0,
        weight_norm=True,
        tie_embeddings=False,
        residual=False,
        forget_bias=1.0,
        init_range=0.0,
        embed_init_std=0.02,
        use_cache=True,
        classifier_features="final_cell",
        classifier_layers=None,
        classifier_outputs=None,
        classifier_max_tokens=0,
        classifier_thresholds=None,
        **kwargs,
    ):
        self.vocab_size = vocab_size
        self.embed_dim = embed_dim
        self.hidden_dim = hidden_dim
        self.num_layers = num_layers
        self.cell = cell  # "mlstm", or "lstm" (the plain-LSTM baseline)
        self.dropout = dropout
        self.weight_norm = weight_norm  # w = g * v / ||v|| per output row, computed in every forward
        self.tie_embeddings = tie_embeddings  # the head is the embedding matrix (no head weights)
        self.residual = residual
        self.forget_bias = forget_bias
        self.init_range = init_range
        self.embed_init_std = embed_init_std
        self.use_cache = use_cache
        # the classifier's head: the feature kind read (final_cell, final_hidden, mean_hidden, max_hidden), of
        # which recurrent layers (side by side, 0-based; default the last), its rows (1 for a two-class
        # logistic probe), texts read up to max_tokens tokens (0: whole), a threshold per label (multi-label)
        self.classifier_features = classifier_features
        self.classifier_layers = classifier_layers if classifier_layers is not None else [num_layers - 1]
        self.classifier_outputs = classifier_outputs
        self.classifier_max_tokens = classifier_max_tokens
        self.classifier_thresholds = classifier_thresholds
        # Tying is done by the model itself (no head module when tied): transformers must not tie.
        kwargs["tie_word_embeddings"] = False
        super().__init__(**kwargs)
