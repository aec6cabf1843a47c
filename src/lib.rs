//! Station Gateway: the one way to a high-voltage test station.
