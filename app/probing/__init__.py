"""Representation transfer ("sentiment neuron" probing): LM features of labelled texts -> L1 logistic regression."""
