"""Discord media: a voice channel as a call transport — RTP in through DAVE, playback out.

A Discord call, read in the order it happens (`bot.discord.calls.CallManager.join` wires it):

1. `discord_client.ListeningVoiceClient` (discord.py's voice client, with DAVE) hands every UDP
   datagram from its socket reader thread to `receive.Receiver`.
2. `receive.Receiver.on_packet`: RTP parse, transport decryption (`transport_cipher`), who sent it
   (SSRC → user id), DAVE decryption, Opus decode (`opus`) — one speaker's 24 kHz mono PCM, per
   member, with a hearing ledger of what failed (`hearing`, `deaf`).
3. `channel.RoomTransport.on_speech` queues each member's frames on their own; every 20 ms one
   `RoomTick` carries each talking member's frame with their own speech-detector score (one batched
   model run per tick for the whole process: `channel.RoomClock`).
4. The call engine (`voice.call.engine.CallEngine`) feeds each tick to the sans-I/O call core
   (`voice.call.core`): a turn per speaker (`voice.call.speakers`), committed one at a time with who
   spoke it, sent to the Realtime provider (`voice.call.providers`) as audio appends and a commit.
5. The provider's audio comes back through the engine to `RoomTransport.play` → `playback.PlaybackSource`
   (upsampled to 48 kHz stereo) → discord.py's player thread → Discord.
"""
