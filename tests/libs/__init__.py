"""Tests of the secure analytics in `mplang.libs`, against numpy and scikit-learn."""
