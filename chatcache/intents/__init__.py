"""A bot's trained intent model: trained by `chatcache train BOT`, found again by what it learned from."""
