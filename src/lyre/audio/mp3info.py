"""The LAME "Info" frame a streamed MP3 starts with (:class:`lyre.audio.formats.AudioEncoder`): the
muxer writes its own Xing/LAME frame only into a seekable file, so a stream gets this one, which
carries the encoder delay (known before encoding) and nothing that needs the stream's end."""

from __future__ import annotations

MP3_KBPS = (0, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320)  # MPEG-1 layer III
MP3_KBPS_LSF = (0, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160)  # MPEG-2 and 2.5
MP3_DECODER_DELAY = 529  # samples every MP3 decoder's synthesis filterbank adds


def _crc16(data: bytes) -> int:
    """CRC-16 (polynomial 0x8005, reflected, initial 0): the LAME tag's checksum."""
    crc = 0
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0xA001 if crc & 1 else crc >> 1
    return crc


def mp3_info_frame(first_frame: bytes, encoder_delay: int) -> bytes:
    """A LAME "Info" frame for the CBR MP3 stream that starts with ``first_frame``: an MPEG frame of
    silence with the same version, sample rate and channels, whose Xing part has no frame count, byte
    count or TOC (unknown while streaming) and whose LAME part carries ``encoder_delay`` and an end
    padding of 0 (unknown). Its header leaves the "original" bit clear, as FFmpeg's own Xing frames
    do, so it never passes for one of the audio frames."""
    head = int.from_bytes(first_frame[:4], "big")
    version, rate_index, mode = (head >> 19) & 3, (head >> 10) & 3, (head >> 6) & 3
    rate = (44100, 48000, 32000)[rate_index] >> {3: 0, 2: 1, 0: 2}[version]
    side_info = (17 if mode == 3 else 32) if version == 3 else (9 if mode == 3 else 17)
    kbps = MP3_KBPS if version == 3 else MP3_KBPS_LSF
    body = b"Info" + bytes(4)  # flags 0: no frames, bytes, TOC or quality fields
    body += b"LAME3.100" + bytes(2 + 8 + 2)  # version; revision/VBR method, lowpass; ReplayGain; flags, bitrate
    body += (min(max(encoder_delay, 0), 4095) << 12).to_bytes(3, "big")  # delay; end padding 0: unknown
    body += bytes(4 + 4 + 2)  # misc, mp3gain, preset; music length, music CRC (unknown)
    index = (head >> 12) & 15
    while True:
        size = (144000 if version == 3 else 72000) * kbps[index] // rate
        if size >= 4 + side_info + len(body) + 2 or index == 14:
            break
        index += 1
    header = 0xFFE00000 | version << 19 | 1 << 17 | 1 << 16 | index << 12 | rate_index << 10 | mode << 6
    frame = header.to_bytes(4, "big") + bytes(side_info) + body
    frame += _crc16(frame).to_bytes(2, "big")
    return frame + bytes(size - len(frame))
