"""What travels between peers and to the host: the messages (one decode table), the framing of
messages and artifacts on a data channel, the commands a state machine hands its host, and the
client side of the signaling protocol."""
