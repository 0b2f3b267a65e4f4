"""Links between peers: the peer links over WebRTC (sans-I/O), the checkpoint relay, and the
coordinator's proof of the room key."""
