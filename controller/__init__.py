"""The operator's runtime: informers, caches, work queue, workers, leader election, reconcile, metrics."""
