"""The queue service, built in issue 3: it will keep the queue hierarchy and its quotas, over-quota weights
and limits, compute each queue's fair share, and order the pending pod groups for a scheduling round.
Nothing is implemented here yet.
"""
