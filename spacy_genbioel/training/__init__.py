"""Training: example builders and the seq2seq loop."""
from .examples import TrainingExample, kb_name_examples
from .seq2seq import TrainConfig, encode_examples, train_seq2seq

__all__ = ["TrainingExample", "kb_name_examples", "TrainConfig", "encode_examples", "train_seq2seq"]
