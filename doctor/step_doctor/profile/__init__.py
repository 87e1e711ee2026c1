"""`step-doctor profile -- python your_train.py`: any training script diagnosed without changing a line.

The command runs as a child with the capture injected at Python start-up (site/), the parent samples
utilization around it (sampler.py, no TensorFlow here), then the analyser diagnoses what
was captured. bench.py measures what the capture costs outside its window.
"""
