"""A kept classifier's inference, written once for app/probing (which fits and keeps it) and app/classifying
(which labels new text with it): its folder (`folder`), its head's arithmetic (`head`), the features it
reads (`features`; which ones: `spec`)."""
