"""The job's state machines: the coordinator (and its round loop), the participant, and what they
are made of: the job spec, attempts, peers' records, schedules, progress, invitations."""
