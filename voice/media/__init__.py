"""Discord media: RTP in (transport decryption, DAVE, Opus, who is speaking) and out (playback),
and a voice channel as a call transport."""
