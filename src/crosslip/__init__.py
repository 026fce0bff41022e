"""crosslip: formal robustness guarantees for classifiers.

A reference implementation of Hein & Andriushchenko, "Formal Guarantees on the Robustness of
a Classifier against Adversarial Manipulation" (NIPS 2017): certified radii (Theorem 2.1),
box-constrained adversarial upper bounds (Section 4) and Cross-Lipschitz regularization
(Section 3).
"""

__version__ = "0.1.0"
