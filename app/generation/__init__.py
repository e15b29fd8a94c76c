"""Generation: recurrent decoder, sampling."""
