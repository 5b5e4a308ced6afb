"""``tempcal ood``: out-of-distribution detection by max-softmax probability and energy."""
